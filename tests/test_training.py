"""Real training in this process on tiny synthetic data: strategies, loop styles, checkpoints, MLflow.

Strategies that need several replicas split the CPU, which only a fresh process can do: see
test_distributed.py. Everything here runs on one device.
"""

from __future__ import annotations

import math
import os
import re

import pytest
import tensorflow as tf

from helpers.config import CONF
from helpers.tracking import metric_history, mlflow_client
from runner.strategy_kinds import STRATEGIES

EPOCH_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "examples_per_second", "learning_rate")


def _finite_and_in_range(result) -> None:
    for epoch in result.history:
        for key, value in epoch.metrics().items():
            assert math.isfinite(value), (key, value)
        assert 0.0 <= epoch["train_accuracy"] <= 1.0 and 0.0 <= epoch["test_accuracy"] <= 1.0
        assert epoch.examples_per_second > 0


def test_tf_keras_is_the_keras_in_use():
    import tf_keras

    # The classes, not the module's name: after the suite's earlier in-process tests (models loaded through
    # MLflow among them) tf.keras can be tf_keras's module registered under the name tensorflow.keras.
    assert tf.keras.Model is tf_keras.Model and tf.keras.layers.Dense is tf_keras.layers.Dense, tf.keras.__file__
    assert tf_keras.__version__.startswith("2.21")
    assert isinstance(tf.keras.optimizers.Adam(), tf_keras.optimizers.Optimizer)


@pytest.mark.parametrize("strategy", ["default", "one_device", "mirrored", "central_storage"])
def test_each_single_machine_strategy_trains(train, strategy):
    result = train(f"strategy={strategy}")
    assert result.num_replicas == 1 and result.global_batch_size == 64
    _finite_and_in_range(result)
    assert result.history[0].examples == 512


def test_every_strategy_option_of_the_config_is_one_the_settings_accept_and_no_other():
    """`strategy=<name>` on the command line picks conf/strategy/<name>.yaml; the settings build exactly those."""
    assert {path.stem for path in (CONF / "strategy").glob("*.yaml")} == set(STRATEGIES)


def test_loop_styles_see_the_same_batches_and_agree(train, tmp_path):
    """Same seed, same batches: every style must give the for-in loop's per-epoch losses."""
    results = {
        style: train(f"loop={style}", "epochs=2", "strategy=one_device", run_dir=tmp_path / style)
        for style in ("for_in", "iterator", "in_function", "multi_step")
    }
    reference = results["for_in"]
    assert [e.steps for e in reference.history] == [8, 8]  # 512 examples / 64
    for style, result in results.items():
        _finite_and_in_range(result)
        assert [e.examples for e in result.history] == [512, 512], style
        for ours, theirs in zip(result.history, reference.history, strict=True):
            assert ours.train_loss == pytest.approx(theirs.train_loss, rel=1e-4), style
            assert ours["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1e-6), style
    assert reference.history[1].train_loss < reference.history[0].train_loss


@pytest.mark.slow  # the Keras 3 CNN, five short runs in this process
def test_the_keras3_lane_agrees_across_loop_styles_and_its_resnet_trains_with_warmup_xla_and_bfloat16(
    train, tmp_path, tracking_uri
):
    """runtime.keras=3: the built-in CNN, Adam and loss in Keras 3, under every loop style (the same batches, the
    for-in loop's losses); and the built-in ResNet in Keras 3 with warm-up, XLA and mixed_bfloat16 together."""
    from runner.builtins import keras_lane

    try:
        results = {
            style: train(f"loop={style}", "runtime.keras=3", "epochs=2", run_dir=tmp_path / style)
            for style in ("for_in", "iterator", "in_function", "multi_step")
        }
        reference = results["for_in"]
        for style, result in results.items():
            _finite_and_in_range(result)
            for ours, theirs in zip(result.history, reference.history, strict=True):
                assert ours.train_loss == pytest.approx(theirs.train_loss, rel=1e-4), style
                assert ours["test_accuracy"] == pytest.approx(theirs["test_accuracy"], abs=1e-6), style
        assert reference.history[1].train_loss < reference.history[0].train_loss
        tuned = train(  # the ResNet in Keras 3 (its BatchNormalization), under the default strategy
            "runtime.keras=3",
            "model=resnet",
            "model.widths=[8]",
            "model.blocks_per_stage=1",
            "strategy=default",
            "lr_scaling=warmup",
            "lr_scaling.base_batch=32",
            "runtime.jit_compile=true",
            "runtime.mixed_precision=mixed_bfloat16",
            "epochs=2",
            run_dir=tmp_path / "tuned",
        )
        _finite_and_in_range(tuned)
        assert tuned.learning_rate == pytest.approx(0.002)  # linear: 0.001 x 64 / 32, reached after the warm-up
        for result in (reference, tuned):
            assert mlflow_client(tracking_uri).get_run(result.run_id).data.tags["keras"].startswith("keras 3.")
    finally:
        keras_lane.select(2)  # this process's other tests build tf_keras models


def test_multi_step_handles_a_last_call_shorter_than_steps_per_call(train):
    result = train("loop=multi_step", "loop.steps_per_call=3", "loop.steps_per_epoch=7", "epochs=2")
    assert [e.steps for e in result.history] == [7, 7]
    assert [e.examples for e in result.history] == [7 * 64, 7 * 64]


def test_iterator_runs_exactly_the_steps_asked(train, tracking_uri):
    result = train("loop=iterator", "loop.steps_per_epoch=5", "epochs=2")
    assert [e.steps for e in result.history] == [5, 5]
    assert [e.examples for e in result.history] == [5 * 64, 5 * 64]
    params = mlflow_client(tracking_uri).get_run(result.run_id).data.params
    assert params["loop.steps_per_epoch"] == "5"


def test_lr_scaling_and_warmup_reach_the_optimizer(train, tracking_uri):
    result = train("lr_scaling=warmup", "lr_scaling.base_batch=32", "epochs=2")
    assert result.learning_rate == pytest.approx(0.002)  # linear: 0.001 x 64 / 32
    client = mlflow_client(tracking_uri)
    rates = metric_history(client, result.run_id, "learning_rate")
    assert rates[0][1] < 0.002 and rates[1][1] == pytest.approx(0.002)
    assert client.get_run(result.run_id).data.params["learning_rate"] == "0.002"


def test_checkpoints_at_the_right_epochs_and_restore_without_strategy(train, tmp_path, tracking_uri):
    run_dir = tmp_path / "ckpt-run"
    result = train("epochs=5", "checkpoint.every_epochs=2", "checkpoint.max_to_keep=2", run_dir=run_dir)
    checkpoints = tf.train.get_checkpoint_state(str(run_dir / "checkpoints"))
    kept = [os.path.basename(p) for p in checkpoints.all_model_checkpoint_paths]
    assert kept == ["ckpt-32", "ckpt-40"]  # named by global step (8 per epoch): epochs 4 and 5 kept
    # The tutorial's last section: a fresh model outside any strategy scores what the run logged.
    assert result.eval_scores["eval_accuracy"] == pytest.approx(result.final["test_accuracy"], abs=1e-6)
    reader = tf.train.load_checkpoint(checkpoints.model_checkpoint_path)
    assert reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE") == 5
    client = mlflow_client(tracking_uri)
    logged = {os.path.basename(f.path) for f in client.list_artifacts(result.run_id, "checkpoints")}
    assert logged == {"ckpt-40.index", "ckpt-40.data-00000-of-00001", "checkpoint"}  # mlflow.checkpoints=last


def _logged_checkpoints(client, run_id: str) -> list[str]:
    """The ckpt-N files among the run's `checkpoints/` artifacts, sorted."""
    top = {item.path for item in client.list_artifacts(run_id)}
    if "checkpoints" not in top:
        return []
    return sorted(
        os.path.basename(item.path)
        for item in client.list_artifacts(run_id, "checkpoints")
        if os.path.basename(item.path).startswith("ckpt-")
    )


@pytest.mark.parametrize("choice,steps", [(None, [24]), ("last", [24]), ("all", [8, 16, 24]), ("none", [])])
def test_mlflow_checkpoints_says_which_checkpoints_the_run_keeps(train, tmp_path, tracking_uri, choice, steps):
    run_dir = tmp_path / "run"
    result = train(
        "epochs=3", "checkpoint.every_epochs=1", *([f"mlflow.checkpoints={choice}"] if choice else []), run_dir=run_dir
    )
    newest = os.path.basename(tf.train.get_checkpoint_state(str(run_dir / "checkpoints")).model_checkpoint_path)
    assert newest == "ckpt-24"  # 8 steps per epoch; the one eval_accuracy measured
    client = mlflow_client(tracking_uri)
    assert client.get_run(result.run_id).info.status == "FINISHED"
    assert _logged_checkpoints(client, result.run_id) == sorted(
        name for step in steps for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001")
    )
    # The run directory keeps checkpoint.max_to_keep (3) whatever the run's artifacts hold.
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.index")) == [
        "ckpt-16.index",
        "ckpt-24.index",
        "ckpt-8.index",
    ]


def test_the_mlflow_run_holds_the_whole_contract(train, tracking_uri):
    result = train("epochs=2", "batch=32")
    client = mlflow_client(tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "fashion_mnist"
    params = run.data.params
    for key in (
        "batch",
        "epochs",
        "seed",
        "strategy.name",
        "strategy.cpu_replicas",
        "dataset.name",
        "dataset.train_examples",
        "model._target_",
        "optimizer.lr",
        "lr_scaling.rule",
        "loop.style",
        "checkpoint.every_epochs",
        "mlflow.experiment_name",
    ):
        assert key in params, key
    assert (params["num_replicas"], params["global_batch_size"], params["batch"]) == ("1", "32", "32")
    assert float(params["learning_rate"]) == pytest.approx(0.001)
    for key in EPOCH_METRICS:
        history = metric_history(client, result.run_id, key)
        assert [step for step, _ in history] == [1, 2], key
    assert metric_history(client, result.run_id, "train_loss")[1][1] == pytest.approx(result.history[1].train_loss)
    assert run.data.metrics["eval_accuracy"] == pytest.approx(result.eval_scores["eval_accuracy"])
    artifacts = {f.path for f in client.list_artifacts(result.run_id)}
    assert {"config.yaml", "overrides.yaml", "checkpoints", "curves.png"} <= artifacts
    local = client.download_artifacts(result.run_id, "config.yaml")
    assert "batch: 32" in open(local).read()
    overrides = open(client.download_artifacts(result.run_id, "overrides.yaml")).read()
    assert "- batch=32" in overrides
    with open(client.download_artifacts(result.run_id, "curves.png"), "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def loss_of_class_200(labels, logits):
    """A loss whose op fails when it runs: it looks up class 200 of 10."""
    return tf.gather(tf.reduce_logsumexp(logits, axis=1), tf.cast(labels, tf.int64) + 200)


def test_a_failure_mid_run_marks_the_run_failed_with_the_error(train, tmp_path, tracking_uri):
    with pytest.raises(tf.errors.InvalidArgumentError):
        train("strategy=one_device", f"loss._target_={__name__}.loss_of_class_200", run_dir=tmp_path / "failing")
    client = mlflow_client(tracking_uri)
    [run] = client.search_runs([client.get_experiment_by_name("fashion_mnist").experiment_id])
    assert run.info.status == "FAILED"
    # Class 200 of the first label (6 + 200): the forward gather or its gradient, whichever op runs first, says so.
    assert "InvalidArgumentError" in run.data.tags["error"]
    assert re.search(r"206 is (out of range|not in) \[0, 64\)", run.data.tags["error"])


# Whether each trace of the loss was inside a function XLA compiles (tf.function(jit_compile=True) traces
# its body in an XLA context), in the order the training traced it.
LOSS_TRACES_IN_XLA: list[bool] = []


def loss_noting_xla(labels, logits):
    """The tutorial's loss, noting whether XLA compiles the function it is traced into."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    from runner.builtins.losses import sparse_categorical_crossentropy

    LOSS_TRACES_IN_XLA.append(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))
    return sparse_categorical_crossentropy(labels, logits)


@pytest.mark.slow  # XLA compiles the step: about 10 s
def test_jit_compile_compiles_the_training_step_with_xla_and_gives_the_same_training(train, tmp_path):
    probe = f"loss._target_={__name__}.loss_noting_xla"
    LOSS_TRACES_IN_XLA.clear()
    plain = train("epochs=2", "strategy=one_device", probe, run_dir=tmp_path / "plain")
    plain_traces = list(LOSS_TRACES_IN_XLA)
    LOSS_TRACES_IN_XLA.clear()
    compiled = train("epochs=2", "strategy=one_device", "runtime.jit_compile=true", probe, run_dir=tmp_path / "xla")
    assert plain_traces and not any(plain_traces)  # the probe traced, and saw no XLA without the flag
    assert any(LOSS_TRACES_IN_XLA), LOSS_TRACES_IN_XLA  # the forward/backward step was compiled with XLA
    for ours, theirs in zip(compiled.history, plain.history, strict=True):
        assert ours.train_loss == pytest.approx(theirs.train_loss, rel=1e-3)


@pytest.mark.slow  # float16 runs as emulated kernels on a CPU: 10-25 s
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_tracks_float32_training(train, tmp_path, policy):
    """Lower-precision maths, same training: the loss curve stays close to float32's."""
    overrides = ("epochs=2", "strategy=one_device", "loop=multi_step", "loop.steps_per_call=4")
    reference = train(*overrides, run_dir=tmp_path / "float32")
    result = train(*overrides, f"runtime.mixed_precision={policy}", run_dir=tmp_path / policy)
    assert tf.keras.mixed_precision.global_policy().name == policy
    _finite_and_in_range(result)
    assert result.history[1].train_loss < result.history[0].train_loss
    for ours, theirs in zip(result.history, reference.history, strict=True):
        assert ours.train_loss == pytest.approx(theirs.train_loss, abs=0.03), policy


def test_float32_is_restored_for_the_next_run(train, tmp_path):
    train("runtime.mixed_precision=mixed_bfloat16", "strategy=one_device", run_dir=tmp_path / "mixed")
    train("strategy=one_device", run_dir=tmp_path / "plain")
    assert tf.keras.mixed_precision.global_policy().name == "float32"


def test_metrics_added_on_the_command_line_are_measured_in_the_replica_logged_per_split_and_evaluated(
    train, tracking_uri, tmp_path
):
    """`+metrics.<name>._target_=<Keras metric>`: made in the strategy's scope, updated in the replica step, logged
    as train_/val_/test_<name> each epoch and eval_<name> after the restore; a cross-entropy metric on the logits
    equals the run's own test_loss (the same per-example losses, averaged), and the top-3 accuracy is at least
    the accuracy. `~metrics.accuracy` leaves only the added ones."""
    added = (
        "+metrics.top3._target_=tf_keras.metrics.SparseTopKCategoricalAccuracy",
        "+metrics.top3.k=3",
        "+metrics.xent._target_=tf_keras.metrics.SparseCategoricalCrossentropy",
        "+metrics.xent.from_logits=true",
    )
    result = train(
        *added, "epochs=2", "dataset.validation_fraction=0.25", "strategy=one_device", run_dir=tmp_path / "a"
    )
    client = mlflow_client(tracking_uri)
    run = client.get_run(result.run_id)
    for epoch in result.history:
        assert list(epoch.model_metrics) == [
            f"{split}_{name}" for split in ("train", "val", "test") for name in ("loss", "accuracy", "top3", "xent")
        ]
        assert epoch["test_xent"] == pytest.approx(epoch["test_loss"], rel=1e-5)
        assert epoch["val_xent"] == pytest.approx(epoch["val_loss"], rel=1e-5)
        assert 0 <= epoch["test_accuracy"] <= epoch["test_top3"] <= 1
    for key in ("train_top3", "val_top3", "test_xent"):
        assert [step for step, _ in metric_history(client, result.run_id, key)] == [1, 2], key
    final = result.history[-1]
    assert result.eval_scores == pytest.approx(
        {"eval_accuracy": final["test_accuracy"], "eval_top3": final["test_top3"], "eval_xent": final["test_xent"]},
        rel=1e-5,
    )
    assert run.data.metrics["eval_top3"] == pytest.approx(final["test_top3"], rel=1e-6)

    alone = train("~metrics.accuracy", "task.objective=top3", *added, "strategy=one_device", run_dir=tmp_path / "b")
    assert list(alone.history[0].model_metrics) == [
        "train_loss",
        "train_top3",
        "train_xent",
        "test_loss",
        "test_top3",
        "test_xent",
    ]
    assert set(alone.eval_scores) == {"eval_top3", "eval_xent"}
