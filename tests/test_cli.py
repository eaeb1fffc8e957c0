"""`python -m runner` as a user runs it: several replicas in a fresh process, and bad input."""

from __future__ import annotations

import re

import pytest

from helpers.cli import NOISE, run_cli
from helpers.presets import SMALL, TINY
from helpers.tracking import metric_history, mlflow_client


def _train_cli(tmp_path, name: str, *overrides: str, env: dict[str, str] | None = None):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = run_cli(
        *SMALL, f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path / name}", *overrides, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = (tmp_path / name / "mlflow_run_id.txt").read_text().strip()
    return mlflow_client(uri), run_id, done.stdout + done.stderr


def _assert_quiet(output: str, epochs: int) -> None:
    """The runner's own lines, nothing of TensorFlow's or MLflow's chatter."""
    assert [noise for noise in NOISE if noise in output] == [], output[-5000:]
    lines = output.splitlines()
    assert sum("first training step done" in line for line in lines) == 1, output[-5000:]
    for epoch in range(1, epochs + 1):
        assert sum(f"epoch {epoch}/{epochs}: train_loss" in line for line in lines) == 1, (epoch, output[-5000:])
    assert sum("done: test_accuracy" in line for line in lines) == 1, output[-5000:]


@pytest.mark.slow
def test_two_replicas_match_one_replica_with_the_same_global_batch(tmp_path):
    """The loss is summed per example and divided by the *global* batch, so splitting a batch of 64
    over two replicas of 32 must not change the maths."""
    # An empty matplotlib cache, as on a machine where nothing has drawn yet: building it is an INFO line.
    client, single, output = _train_cli(
        tmp_path, "one", "strategy=one_device", "batch=64", env={"MPLCONFIGDIR": str(tmp_path / "matplotlib")}
    )
    _assert_quiet(output, epochs=2)
    reference = [value for _, value in metric_history(client, single, "train_loss")]
    for strategy in ("mirrored", "central_storage"):
        _, run_id, output = _train_cli(
            tmp_path, strategy, f"strategy={strategy}", "strategy.cpu_replicas=2", "batch=32"
        )
        _assert_quiet(output, epochs=2)  # without the "Reduce to ... then broadcast" lines of several replicas
        log_file = (tmp_path / strategy / "runner.log").read_text()
        assert "epoch 2/2: train_loss" in log_file and "[tensorflow][INFO]" not in log_file
        params = client.get_run(run_id).data.params
        assert (params["num_replicas"], params["global_batch_size"]) == ("2", "64"), strategy
        losses = [value for _, value in metric_history(client, run_id, "train_loss")]
        assert len(losses) == 2
        for ours, theirs in zip(losses, reference, strict=False):
            assert abs(ours - theirs) / theirs < 1e-3, (strategy, losses, reference)
        assert client.get_run(run_id).info.status == "FINISHED"
    assert reference[1] < reference[0]


@pytest.mark.slow
@pytest.mark.parametrize("verbose", ["verbose=false", "verbose=true", "hydra.verbose=true"])
def test_tpu_without_a_tpu_fails_with_advice_and_no_traceback(tmp_path, verbose):
    """TensorFlow loads and probes for devices, then the paragraph; TensorFlow's INFO lines only when verbose."""
    done = run_cli(
        *TINY, "strategy=tpu", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", verbose, cwd=tmp_path
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "strategy=tpu found no TPU" in line and "strategy=mirrored" in line
    assert not (tmp_path / "mlflow.db").exists()  # nothing was tracked for a run that never started
    if verbose == "verbose=false":
        assert done.stderr.strip().splitlines() == [line], done.stderr[-3000:]
    else:  # TensorFlow's C++ INFO lines are back (which ones depends on the machine: CUDA probe, CPU features,
        # the oneDNN notice on CPUs with AVX-512)
        assert re.search(r"^I\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] ", done.stderr, re.MULTILINE), done.stderr[-3000:]


def test_help_says_what_runner_does_with_examples_then_the_groups(tmp_path):
    """The groups include the options of the user's own config directory (hydra.searchpath)."""
    (tmp_path / "conf_mylab" / "model").mkdir(parents=True)
    (tmp_path / "conf_mylab" / "model" / "convnet.yaml").write_text("_target_: mylab.models.convnet\n")
    done = run_cli("hydra.searchpath=[file://conf_mylab]", "--help", cwd=tmp_path)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("runner: trains TensorFlow"), lines[:3]
    examples = "\n".join(lines[:10])
    for command in ("python -m runner strategy=", "python -m runner -m ", "cluster=local", "mlflow ui"):
        assert command in examples, examples
    assert lines.index("== Configuration groups ==") < lines.index("== Config ==")
    assert any(line.startswith("strategy: ") and "mirrored" in line for line in lines)
    assert "model: cnn, convnet, resnet" in lines, done.stdout
    assert "task: binary, classification, multilabel, regression" in lines, done.stdout
    for example in ("python -m runner task=regression", "+metrics.top5._target_=tf_keras.metrics."):
        assert example in examples, examples
    config = lines[lines.index("== Config ==") :]
    assert "metrics:" in config and "  accuracy:" in config, done.stdout  # the task's metric, by name


@pytest.mark.parametrize(
    "override,named",
    [
        ("batch=0", "batch=0"),
        ("batch=-3", "batch=-3"),
        ("batch=abc", "batch='abc'"),
        ("dataset.dir=/nowhere", "dataset.dir='/nowhere'"),
        ("strategy=one_device strategy.cpu_replicas=2", "strategy.cpu_replicas=2"),
        ("mlflow.experiment_name=", "mlflow.experiment_name=''"),
        ("optimizer.lr=nan", "optimizer.lr=nan"),
        ("checkpoint=5", "checkpoint=5"),
        ("mlflow.run_name=[a]", "mlflow.run_name=['a']"),
        ("task=binary task.objective=roc", "task.objective='roc'"),
        ("task=regression sweep.direction=maximize", "sweep.direction=maximize"),
        (
            "task=regression +metrics.acc._target_=tf_keras.metrics.SparseCategoricalAccuracy",
            "metrics.acc='tf_keras.metrics.SparseCategoricalAccuracy'",
        ),
    ],
)
def test_bad_input_exits_nonzero_with_one_paragraph_before_any_run(tmp_path, override, named):
    done = run_cli(*override.split(), f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith(f"error: {named} is not valid")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists()
    # Refused before Hydra (a value of the wrong type): nothing written; after it, the log ends with the paragraph.
    for log_file in tmp_path.glob("outputs/*/*/runner.log"):
        assert log_file.read_text().splitlines()[-1] == done.stderr.strip()


def test_unknown_group_option_names_it_and_lists_the_choices(tmp_path):
    done = run_cli("strategy=mirroredd", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: strategy=mirroredd is not valid: the strategy group has no option 'mirroredd' (did you mean "
        "strategy=mirrored?); its options are central_storage, default, mirrored, multi_worker_mirrored, one_device, "
        "parameter_server, tpu. Fix: pick one of them, e.g. strategy=mirrored."
    ), done.stderr
