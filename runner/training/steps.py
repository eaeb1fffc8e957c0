"""What happens inside one step, on one replica, and its distributed wrappers.

The replica steps are the tutorial's: per-example loss (reduction NONE) averaged over the *global*
batch with tf.nn.compute_average_loss, scaled regularisation losses, metrics updated inside the
replica, and strategy.reduce(SUM) for the loss. Everything is created under strategy.scope().
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from runner.training.optimizer import LossScaling

NON_FINITE_LOSS = "runner: the training loss is NaN or infinite"


def tutorial_scores() -> dict[str, tf.keras.metrics.Metric]:
    """The tutorial's one score: the share of examples whose largest logit is their label."""
    return {"accuracy": tf.keras.metrics.SparseCategoricalAccuracy()}


@dataclass
class TrainingState:
    """Model, optimizer, metrics and the epoch counter: everything a checkpoint or a step touches. The scores
    (the `metrics` config, by name) are kept twice: the training pass's and the evaluation passes'."""

    model: tf.keras.Model
    optimizer: tf.keras.optimizers.Optimizer
    train_scores: dict[str, tf.keras.metrics.Metric]
    trained_examples: tf.keras.metrics.Metric  # the examples the training pass saw (its throughput)
    test_loss: tf.keras.metrics.Metric
    test_scores: dict[str, tf.keras.metrics.Metric]
    epoch: tf.Variable
    outputs: tuple[int, ...] = ()  # the model's output shape for one example (a score made late is built for it)

    @classmethod
    def create(cls, build_model, build_optimizer, build_scores=None, outputs: tuple[int, ...] = ()) -> TrainingState:
        """Call inside strategy.scope(): the model first, then its optimizer over its variables, then the scores
        (`build_scores()`: a new Keras metric per name at each call; None: the tutorial's accuracy)."""
        build_scores = build_scores or tutorial_scores
        model = build_model()
        return cls(
            model=model,
            optimizer=build_optimizer(model.trainable_variables),
            train_scores=build_scores(),
            trained_examples=tf.keras.metrics.Sum(name="trained_examples"),
            test_loss=tf.keras.metrics.Mean(name="test_loss"),
            test_scores=build_scores(),
            epoch=tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch"),
            outputs=tuple(outputs),
        )

    def reset_metrics(self) -> None:
        for metric in (*self.train_scores.values(), self.trained_examples, *self.evaluation_metrics()):
            metric.reset_state()

    def evaluation_metrics(self) -> tuple[tf.keras.metrics.Metric, ...]:
        """What an evaluation pass (validation, test) accumulates: the loss's mean, then the scores."""
        return (self.test_loss, *self.test_scores.values())

    def evaluation_results(self, split: str) -> dict[str, float]:
        """An evaluation pass's metrics as `split`_<name> (split: val, test)."""
        results = {f"{split}_loss": float(self.test_loss.result())}
        results.update((f"{split}_{name}", float(metric.result())) for name, metric in self.test_scores.items())
        return results


def _as_they_are(outputs):
    return outputs


class ReplicaSteps:
    """The train and test step on one replica, and their distributed forms for a strategy."""

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        state: TrainingState,
        global_batch: int,
        per_example_loss,
        jit_compile: bool = False,
        scored=_as_they_are,
    ):
        """`per_example_loss(labels, logits)`: one loss per example (the task's loss); `scored(logits)`: what the
        scores are updated with (the task's: runner.training.task.Experiment.scored; by default the logits)."""
        self.strategy = strategy
        self.state = state
        self.global_batch = global_batch
        self.per_example_loss = per_example_loss
        self.scored = scored
        self._loss_scaling = LossScaling.of(state.optimizer)  # tf_keras's or Keras 3's, None without
        # XLA compiles the per-replica maths only: apply_gradients all-reduces across replicas,
        # which must stay outside a jit-compiled function under every strategy.
        self._forward_backward = (
            tf.function(self.forward_backward, jit_compile=True) if jit_compile else self.forward_backward
        )
        self._predict = tf.function(self.predict, jit_compile=True) if jit_compile else self.predict

    def compute_loss(self, labels, logits, model_losses):
        per_example_loss = self.per_example_loss(labels, logits)
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=self.global_batch)
        if model_losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        return loss

    def forward_backward(self, images, labels):
        model, scaling = self.state.model, self._loss_scaling
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = self.compute_loss(labels, logits, model.losses)
            # float16 gradients underflow: scale the loss up, and the gradients back down.
            target = scaling.scaled_loss(loss) if scaling else loss
        gradients = tape.gradient(target, model.trainable_variables)
        if scaling:
            gradients = scaling.unscaled_gradients(gradients)
        return loss, gradients, logits

    def predict(self, images):
        return self.state.model(images, training=False)

    def train_replica_step(self, inputs):
        images, labels = inputs
        loss, gradients, logits = self._forward_backward(images, labels)
        # A diverged step fails here, before its gradients can reach the weights.
        with tf.control_dependencies([tf.debugging.assert_all_finite(loss, NON_FINITE_LOSS)]):
            self.state.optimizer.apply_gradients(zip(gradients, self.state.model.trainable_variables, strict=True))
        scored = self.scored(logits)
        for score in self.state.train_scores.values():
            score.update_state(labels, scored)
        self.state.trained_examples.update_state(tf.cast(tf.shape(logits)[0], tf.float32))
        return loss

    def test_replica_step(self, inputs):
        images, labels = inputs
        logits = self._predict(images)
        self.state.test_loss.update_state(self.per_example_loss(labels, logits))
        scored = self.scored(logits)
        for score in self.state.test_scores.values():
            score.update_state(labels, scored)

    def distributed_train_step(self, inputs):
        """One global step: run on every replica, return the loss summed over replicas."""
        per_replica_losses = self.strategy.run(self.train_replica_step, args=(inputs,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    def distributed_test_step(self, inputs):
        self.strategy.run(self.test_replica_step, args=(inputs,))
