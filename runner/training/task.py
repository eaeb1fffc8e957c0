"""What is trained, as one replica sees it (Model Garden's Task): the model, the optimizer and its learning
rate, the per-example loss, the scores, and the model as it is exported, for the kind of prediction the run makes
(task.kind: runner.task_kinds). The components come from the config's
`_target_`s (runner.config.components) and the data's description (runner.data.source.DataSpec); no strategy code
lives here: the trainer builds the model and optimizer inside strategy.scope()."""

from __future__ import annotations

import math
import re
from typing import Any

import tensorflow as tf

from runner.builtins import keras_lane
from runner.compat.keras_metrics import build_for_outputs
from runner.config.components import Component, call
from runner.config.schema import DEFAULT_METRICS, MetricSettings, OptimizerSettings, Settings
from runner.data.source import DataSpec
from runner.errors import RunnerError
from runner.task_kinds import KINDS, TaskKind
from runner.training.lr_scaling import linear_warmup

LANE_NAMES = {2: "tf_keras", 3: "Keras 3"}


class Experiment:
    """A model whose outputs for one example are shaped `spec.outputs` (a classifier's logits, a regression's
    values), trained on per-example losses of them, in the Keras it is written in (tf_keras or Keras 3:
    runner.builtins.keras_lane), which its optimizer and schedule follow."""

    def __init__(
        self,
        model: Component,
        optimizer: OptimizerSettings,
        schedule: Component,
        loss: Component,
        spec: DataSpec,
        metrics: tuple[MetricSettings, ...] = DEFAULT_METRICS,
        kind: TaskKind = KINDS["classification"],
    ):
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule
        self.loss = loss
        self.spec = spec
        self.metrics = metrics
        self.kind = kind
        self._loss_function = loss.resolve()

    @classmethod
    def from_settings(cls, settings: Settings, spec: DataSpec) -> Experiment:
        return cls(
            settings.model,
            settings.optimizer,
            settings.schedule,
            settings.loss,
            spec,
            settings.metrics,
            KINDS[settings.task.kind],
        )

    def build_model(self):
        """The model callable's Keras model (call inside strategy.scope()), its variables created; the built-in
        components follow its Keras from now on."""
        key, target = "model._target_", self.model.target
        model = call(
            key,
            target,
            lambda: self.model.instantiate(input_shape=tuple(self.spec.input_shape), num_classes=self.spec.num_classes),
        )
        version = keras_lane.version_of(model)
        if version is None or not isinstance(model, keras_lane.api(version).Model):
            raise RunnerError(
                f"{key}={target!r} returned {type(model).__module__}.{type(model).__qualname__}, not a Keras "
                "model. Fix: return a Keras model (Sequential, functional or subclassed) that outputs logits, built "
                "with tf_keras (`import tf_keras as keras`) or Keras 3 (`import keras`)."
            )
        keras_lane.select(version)
        if not model.built:  # a subclassed model makes its variables when first called
            call(key, target, lambda: model(tf.zeros((1, *self.spec.input_shape)), training=False))
        outputs = call(key, target, lambda: model.compute_output_shape((None, *self.spec.input_shape)))
        if tuple(outputs)[1:] != self.spec.outputs:
            raise RunnerError(self._output_refusal(tuple(outputs)))
        return model

    def _output_refusal(self, outputs: tuple) -> str:
        key, target, spec = "model._target_", self.model.target, self.spec
        if self.kind.class_indices:
            wanted = f"the data has {spec.num_classes} classes"
            fix = "end the model with a layer of num_classes units (the callable receives num_classes), giving logits"
        else:
            wanted = f"task={self.kind.name}'s labels are shaped {spec.outputs} per example"
            fix = (
                f"make the model output {spec.outputs} per example (the callable receives num_classes="
                f"{spec.num_classes}, the labels' last size), or give labels shaped like its output"
            )
        return (
            f"{key}={target!r} outputs shape {outputs} for inputs {tuple(spec.input_shape)}, but {wanted}. Fix: {fix}."
        )

    def learning_rate(self, effective: float, total_steps: int, warmup_steps: int):
        """The schedule's rate (or schedule) from the effective rate, ramped up by lr_scaling's warm-up."""
        key, target = "schedule._target_", self.schedule.target
        rate = call(key, target, lambda: self.schedule.instantiate(learning_rate=effective, total_steps=total_steps))
        return linear_warmup(rate, warmup_steps, keras_lane.selected()) if warmup_steps > 0 else rate

    def build_optimizer(self, learning_rate):
        """The optimizer callable's optimizer, of the model's Keras (build the model first)."""
        key, target = "optimizer._target_", self.optimizer.component.target
        optimizer = call(key, target, lambda: self.optimizer.component.instantiate(learning_rate=learning_rate))
        wanted = keras_lane.selected()
        version = keras_lane.version_of(optimizer)
        if version != wanted or not isinstance(optimizer, keras_lane.api(wanted).optimizers.Optimizer):
            kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
            module = "`import keras`" if wanted == 3 else "`import tf_keras as keras`"
            raise RunnerError(
                f"{key}={target!r} returned {kind}, not an optimizer of the model's Keras ({LANE_NAMES[wanted]}): "
                "a Keras optimizer updates only the variables of its own Keras. Fix: return a "
                f"keras.optimizers.Optimizer built with {module}, as the model is, or use a built-in optimizer "
                "(optimizer=adam, sgd or adamw), which follows the model's Keras."
            )
        return optimizer

    def build_scores(self) -> dict[str, Any]:
        """A new Keras metric for each score of the `metrics` config, by name (call inside strategy.scope(): its
        state is then summed over replicas and workers when read)."""
        scores = {}
        for each in self.metrics:
            key, target = f"{each.component.group}._target_", each.component.target
            metric = call(key, target, each.component.instantiate)
            version = keras_lane.version_of(metric)
            if version is None or not isinstance(metric, keras_lane.api(version).metrics.Metric):
                raise RunnerError(
                    f"{key}={target!r} returned {type(metric).__module__}.{type(metric).__qualname__}, not a Keras "
                    "metric. Fix: name a Keras metric class (tf_keras.metrics.*, keras.metrics.*, or a subclass of "
                    "keras.metrics.Metric with update_state(y_true, y_pred) and result())."
                )
            build_for_outputs(metric, self.spec.outputs)
            scores[each.name] = metric
        return scores

    def check_scores(self, batches: tf.data.Dataset) -> None:
        """Before training: every metric of the run, new, updated on the labels of the first of `batches` (shaped as
        the task feeds them) against outputs shaped as the model's (through `scored`, as the replica step updates
        them), gives one number; a metric that cannot take them, or whose result is not one number, is one
        paragraph naming it, the task and the fix."""
        first = next(iter(batches.take(1)), None)
        if first is None:  # no test example: nothing to score, and nothing scored
            return
        _, labels = first
        outputs = self.scored(tf.zeros((tf.shape(labels)[0], *self.spec.outputs), tf.float32))
        task = f"task={self.kind.name}"
        for each, (name, metric) in zip(self.metrics, self.build_scores().items(), strict=True):
            key, target = f"{each.component.group}", each.component.target
            try:
                metric.update_state(labels, outputs)
                shape = tuple(tf.convert_to_tensor(metric.result()).shape)
            except Exception as error:  # noqa: BLE001  any error of a user's metric becomes the paragraph below
                cause = re.sub(r"<tf\.Tensor: .*?>", "a tensor", " ".join(str(error).split()))
                cause = cause if len(cause) <= 300 else cause[:300] + "..."
                raise RunnerError(
                    f"{key}={target!r} cannot score {task}: updated with its labels (shaped {tuple(labels.shape)}, "
                    f"{labels.dtype.name}) and the model's outputs (shaped {tuple(outputs.shape)}) it raised "
                    f"{type(error).__name__}: {cause}. Fix: use a metric that takes {task}'s labels and outputs "
                    f"(docs/your-own-experiment.md lists those that suit each task), or drop it (~{key})."
                ) from None
            if shape != ():
                raise RunnerError(
                    f"{key}={target!r} gives {math.prod(shape)} numbers on {task} (a result shaped {shape}), not "
                    f"one: a run logs one number per metric and epoch (`{name}`). Fix: ask it for one number "
                    f"(F1Score and FBetaScore: +{key}.average=macro, micro or weighted; with probabilities, "
                    f"+{key}.threshold=0.5), or drop it (~{key})."
                )

    def scored(self, outputs):
        """What the scores are updated with, from the model's outputs: the probabilities of binary and multi-label
        logits (so that Keras' thresholds at 0.5 hold), else the outputs as they are (a classifier's logits, a
        regression's values)."""
        if self.kind.activation != "sigmoid":
            return outputs
        return tf.sigmoid(tf.cast(outputs, tf.float32))

    def per_example_loss(self, labels, logits):
        """One loss per example; the replica step averages them over the global batch."""
        return self._loss_function(labels, logits, **self.loss.arguments)

    def export_model(self, model):
        """`model` (its weights shared, not copied) behind what the runner does to raw inputs, and the task's last
        layer on its outputs (a softmax of a classifier's logits, a sigmoid of binary and multi-label logits,
        nothing after a regression's values), in the model's Keras: inputs as the data holds them in (e.g. uint8
        pixels, (n, 28, 28)), what the task serves out.

        Normalization with mean 0 and variance scale**2 computes x / sqrt(scale**2) = x / scale, the very float32
        division of runner.data.in_memory.to_model_input (Rescaling's x * (1 / 255) differs from it in the last bit
        for 126 of the 256 pixel values). The added layers compute in float32 whatever the mixed-precision policy,
        as the input pipeline does."""
        spec, keras = self.spec, keras_lane.api(keras_lane.version_of(model))
        raw = keras.Input(shape=spec.raw_shape, dtype=spec.raw_dtype, name="images")
        scaled = keras.layers.Normalization(mean=0.0, variance=spec.scale**2, dtype="float32", name="scale")(raw)
        if tuple(spec.raw_shape) != tuple(spec.input_shape):
            scaled = keras.layers.Reshape(spec.input_shape, dtype="float32", name="channel")(scaled)
        outputs = model(scaled)
        if self.kind.activation == "softmax":
            outputs = keras.layers.Softmax(dtype="float32", name="probabilities")(outputs)
        elif self.kind.activation == "sigmoid":
            outputs = keras.layers.Activation("sigmoid", dtype="float32", name="probabilities")(outputs)
        else:
            outputs = keras.layers.Activation("linear", dtype="float32", name="predictions")(outputs)
        return keras.Model(raw, outputs, name=f"{spec.name}_{self.kind.role}")
