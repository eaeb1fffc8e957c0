"""The config's one schema: every key has one default, an unknown key or option is one paragraph with the closest
valid one (before Hydra, before a sweep's parent run), and a user's `_target_` is checked before any run."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers.cli import run_cli
from helpers.config import CONF, REPO, compose, overridden
from helpers.presets import TINY
from runner.config.check import check_command_line, unknown_keys
from runner.config.schema import Settings
from runner.config.settings import validate
from runner.errors import RunnerError


def _refusal(*arguments: str) -> str:
    with pytest.raises(RunnerError) as raised:
        check_command_line(list(arguments))
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message, message
    return message


# --- one default in one place -----------------------------------------------------------------------------------


def test_settings_and_config_yaml_repeat_no_default():
    source = (REPO / "runner" / "config" / "settings.py").read_text()
    assert re.findall(r"\.get\(\"[\w.]+\", [^)]", source) == []  # a key looked up with a fallback of its own
    import runner.config.settings as settings

    for name in dir(settings):
        kind = getattr(settings, name)
        if dataclasses.is_dataclass(kind) and kind.__module__ == settings.__name__:
            defaults = [
                field.name
                for field in dataclasses.fields(kind)
                if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
            ]
            assert defaults == [], (name, defaults)
    config = OmegaConf.load(CONF / "config.yaml")
    assert set(config) == {"defaults", "hydra"}, set(config)
    assert config.defaults[0] == "runner_schema"


def test_every_key_of_the_composed_default_has_a_value_and_comes_from_the_schema():
    config = compose([])
    assert OmegaConf.missing_keys(config) == set()
    assert unknown_keys(config) == []
    assert config.cluster.port_base == Settings().cluster.port_base  # the schema's value, nowhere else


# --- unknown keys and options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments,starts,closest",
    [
        (["+batch_size=128"], "+batch_size=128 is not valid: the config has no key 'batch_size'", "batch"),
        (["epoch=1"], "epoch=1 is not valid: the config has no key 'epoch'", "epochs"),
        (["mlflow.experment_name=x"], "mlflow.experment_name=x is not valid", "mlflow.experiment_name"),
        (
            ["+mlflow.system_metrics.interval=5"],
            "+mlflow.system_metrics.interval=5 is not valid",
            "mlflow.system_metrics.interval_seconds",
        ),
        (["++strategy.device=[/cpu:0]"], "++strategy.device=[/cpu:0] is not valid", "strategy.devices"),
        (["stratgy=one_device"], "stratgy=one_device is not valid", "strategy"),
        (["hydra.run.dirr=x"], "hydra.run.dirr=x is not valid", "hydra.run.dir"),
        (
            ["loop=multistep"],
            "loop=multistep is not valid: the loop group has no option 'multistep'",
            "loop=multi_step",
        ),
        (
            ["-m", "lr_scaling=none,lineer"],
            "lr_scaling=lineer is not valid: the lr_scaling group has no option",
            "lr_scaling=linear",
        ),
        (["-m", "epoch=1,2"], "epoch=1 is not valid: the config has no key 'epoch'", "epochs"),
        (["-m", "batch=32,64", "optimizer=adamm,sgd"], "optimizer=adamm is not valid", "optimizer=adam"),
        (
            ["task=regresion"],
            "task=regresion is not valid: the task group has no option 'regresion'",
            "task=regression",
        ),
    ],
)
def test_an_unknown_key_or_option_names_the_closest_valid_one(arguments, starts, closest):
    message = _refusal(*arguments)
    assert message.startswith(starts), message
    assert f"(did you mean {closest}?)" in message, message


def test_the_target_groups_take_their_callables_arguments_without_plus():
    assert compose(["model=resnet", "model.blocks_per_stage=1", "model.new_argument=3"]).model.new_argument == 3
    check_command_line(["model=resnet", "model.blocks_per_stage=1"])  # composes; the signature check comes later


def test_a_sweep_is_only_a_sweep_with_m():
    message = _refusal("batch=32,64")
    assert message.startswith("batch=32,64 is not valid: it gives several values") and "-m" in message
    check_command_line(["-m", "batch=32,64"])


def test_an_unreadable_override_is_one_paragraph():
    assert _refusal("batch=[1").startswith("'batch=[1' is not valid: Hydra cannot read it")


@pytest.mark.alone  # it times the check
def test_a_normal_command_line_is_checked_in_well_under_a_second():
    check_command_line(["strategy=one_device"])  # Hydra's plugins are discovered once per process

    def seconds_to_check() -> float:
        started = time.perf_counter()
        check_command_line(["strategy=one_device", "batch=128", "optimizer.lr=0.002", "epochs=2", "loop=multi_step"])
        # A sweep's other values of a key are set on a copy of the first composition, not composed anew.
        check_command_line(["-m", "batch=16,32,64,128", "optimizer.lr=0.1,0.01,0.001", "seed=1,2,3"])
        return time.perf_counter() - started

    # The best of three, as timeit reports: the check's own time, not a pause of the machine's (a garbage
    # collection, another process) that one measurement may fall on.
    assert min(seconds_to_check() for _ in range(3)) < 1.0


def test_each_value_of_a_swept_key_or_group_is_checked():
    assert _refusal("-m", "batch=32,abc").startswith("batch='abc' is not valid: it must be a positive integer")
    assert _refusal("-m", "optimizer=sgd,adamw", "optimizer.momentum=0.5").startswith(
        "optimizer.momentum is not valid: runner.builtins.optimizers.adamw takes no argument 'momentum'"
    )
    assert _refusal("-m", "model.weight_decay=0,1", "+model.depth=1,2").startswith("model.depth is not valid")


# --- values of the wrong type: runner.config.settings' paragraph -----------------------------------------------------


@pytest.fixture(scope="module")
def defaults() -> dict:
    return OmegaConf.to_container(compose([]), resolve=True)


@pytest.mark.parametrize(
    "override",
    [
        "batch=abc",
        "batch=2.5",
        "batch=",
        "epochs=1e9",
        "checkpoint=5",
        "mlflow=5",
        "sweep=5",
        "mlflow.run_name=[a]",
        "mlflow.experiment_name=null",
        "mlflow.experiment_name=[a,b]",
        "strategy.variable_partitioner=5",
        "mlflow.system_metrics=5",
        "loop.steps_per_call=",
        "dataset.train_examples=many",
        "strategy.cpu_replicas=two",
    ],
)
def test_a_value_the_schema_refuses_gets_the_settings_paragraph(defaults, override):
    with pytest.raises(RunnerError) as expected:
        validate(overridden(defaults, override))
    assert _refusal(override) == str(expected.value)


@pytest.mark.parametrize(
    "override",
    [
        "progress=1",
        "runtime.deterministic=1",
        "mlflow.register=yes",
        "strategy.tpu=5",
        "optimizer.lr='0.5'",
        "cluster.timeout_seconds=0",
    ],
)
def test_omegaconf_does_not_coerce_what_the_settings_refuse(defaults, override):
    """The schema lets these through as typed, so that runner.config.settings refuses them with the value as given."""
    config = OmegaConf.to_container(compose([override]), resolve=True)
    with pytest.raises(RunnerError) as composed:
        validate(config)
    with pytest.raises(RunnerError) as plain:
        validate(overridden(defaults, override))
    assert str(composed.value) == str(plain.value)


# --- through python -m runner: exit 2, one paragraph, no MLflow run -----------------------------------------------


def _runs(db: Path) -> int:
    """How many runs the sqlite store holds (0 when the command never created it)."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def _with_tiny(arguments: list[str]) -> list[str]:
    """Hydra's options (-m) first, then the tiny run's overrides and the test's."""
    return [*(a for a in arguments if a.startswith("-")), *TINY, *(a for a in arguments if not a.startswith("-"))]


def _refused(tmp_path, *arguments: str, env: dict[str, str] | None = None) -> str:
    db = tmp_path / "mlflow.db"
    done = run_cli(
        *arguments,
        f"mlflow.tracking_uri=sqlite:///{db}",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert _runs(db) == 0
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(
    "arguments,starts",
    [
        (["+batch_size=128"], "+batch_size=128 is not valid: the config has no key 'batch_size' (did you mean batch?)"),
        (["epoch=1"], "epoch=1 is not valid: the config has no key 'epoch' (did you mean epochs?)"),
        (
            ["loop=multistep"],
            "loop=multistep is not valid: the loop group has no option 'multistep' (did you mean loop=multi_step?)",
        ),
        (["model.hiden=32"], "model.hiden is not valid: runner.builtins.models.cnn takes no argument 'hiden'"),
        (["progress=1"], "progress=1 is not valid: it must be true or false"),
        (
            ["-m", "lr_scaling=none,lineer"],
            "lr_scaling=lineer is not valid: the lr_scaling group has no option 'lineer'",
        ),
        (["-m", "epoch=1,2"], "epoch=1 is not valid: the config has no key 'epoch' (did you mean epochs?)"),
        (["-m", "batch=32,64", "model.hiden=32"], "model.hiden is not valid"),
        (["early_stopping.patience=-1"], "early_stopping.patience=-1 is not valid: it must be an integer >= 0 or null"),
        (
            ["early_stopping.patience=2", "early_stopping.monitor=val_los"],
            "early_stopping.monitor='val_los' is not valid: it must be a metric of every epoch, train_loss, "
            "train_accuracy, val_loss, val_accuracy, test_loss, test_accuracy (did you mean "
            "early_stopping.monitor=val_loss?)",
        ),
        (  # in a sweep too, before its parent run, however the monitor is swept
            ["-m", "early_stopping.patience=2", "early_stopping.monitor=val_loss,val_los"],
            "early_stopping.monitor='val_los' is not valid: it must be a metric of every epoch, train_loss, ",
        ),
        (
            ["-m", "optimizer.lr=0.1,0.2", "task.objective=acuracy"],
            "task.objective='acuracy' is not valid: a sweep chooses on val_<it> when sweep.objective is null",
        ),
        (
            ["early_stopping.patience=2", "early_stopping.start_epoch=3", "epochs=2"],
            "early_stopping.start_epoch=3 is not valid: it comes after the run's last epoch (epochs)",
        ),
        (  # the data is read before it is known that it has no validation split: still before the run
            ["early_stopping.patience=2", "strategy=one_device"],
            "early_stopping.monitor (null: val_loss) is not valid: this run has no validation split, so it has no "
            "val_loss to watch. Fix: hold one out with dataset.validation_fraction=0.1",
        ),
    ],
)
def test_the_command_refuses_before_hydra_and_before_a_sweeps_parent_run(tmp_path, arguments, starts):
    assert _refused(tmp_path, *_with_tiny(arguments)).startswith(starts)


def test_a_sweep_started_from_another_config_dir_is_checked_by_its_callback(tmp_path):
    """--config-dir skips the command-line check (Hydra reads a directory it cannot see): the sweep's callback
    refuses an unknown key or a target's bad argument before the parent run."""
    extra = tmp_path / "extra_conf"
    extra.mkdir()
    base = ["--config-dir", str(extra), "-m", *TINY, "batch=32,64"]
    assert _refused(tmp_path, *base, "+batch_size=1").startswith(
        "+batch_size=1 is not valid: the config has no key 'batch_size' (did you mean batch?)"
    )
    assert _refused(tmp_path, *base, "+model.hiden=1").startswith("model.hiden is not valid")


USER_TARGETS = """
def mlp(input_shape, num_classes, hidden=32, weight_decay=0.0):
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=input_shape), tf.keras.layers.Dense(hidden),
                                tf.keras.layers.Dense(num_classes)])


def not_a_model(input_shape, num_classes, weight_decay=0.0):
    return 42


def broken(input_shape, num_classes, weight_decay=0.0):
    raise ValueError("the lab's model needs 3 channels")


def shaped(shape, num_classes, weight_decay=0.0):
    raise NotImplementedError
"""


@pytest.fixture
def user_targets(tmp_path) -> dict[str, str]:
    """A module of the user's own on PYTHONPATH: the environment to run the command in."""
    (tmp_path / "mylab_targets.py").write_text(USER_TARGETS)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize(
    "arguments,starts",
    [
        (
            ["model._target_=mylab_targets.mlp", "model.hiden=8"],
            "model.hiden is not valid: mylab_targets.mlp takes no argument 'hiden' (did you mean model.hidden?)",
        ),
        (["model._target_=mylab_nowhere.mlp"], "model._target_='mylab_nowhere.mlp' could not be imported"),
        (
            ["model._target_=mylab_targets.mpl"],
            "model._target_='mylab_targets.mpl' is not valid: module mylab_targets "
            "has no 'mpl' (did you mean mylab_targets.mlp?)",
        ),
        (
            ["strategy=multi_worker_mirrored", "cluster=local", "model._target_=mylab_targets.mlp", "model.hiden=8"],
            "model.hiden is not valid",
        ),
        (
            ["-m", "batch=32,64", "model._target_=mylab_targets.mlp,mylab_nowhere.mlp"],
            "model._target_='mylab_nowhere.mlp' could not be imported",
        ),
        (
            ["model._target_=mylab_targets.shaped"],
            "model._target_='mylab_targets.shaped' is not valid: the runner calls a model callable with the keyword "
            "arguments input_shape and num_classes, and mylab_targets.shaped has no parameter 'input_shape'",
        ),
    ],
)
def test_a_user_targets_bad_argument_or_path_is_refused_before_any_run(tmp_path, user_targets, arguments, starts):
    assert _refused(tmp_path, *_with_tiny(arguments), env=user_targets).startswith(starts)
    assert not (tmp_path / "run" / "tasks").exists()  # cluster=local started no task


@pytest.mark.slow
@pytest.mark.parametrize(
    "target,starts",
    [
        ("not_a_model", "model._target_='mylab_targets.not_a_model' returned builtins.int, not a Keras model"),
        (
            "broken",
            "model._target_='mylab_targets.broken' raised ValueError when the runner called it: the lab's model "
            "needs 3 channels",
        ),
    ],
)
def test_a_user_target_that_fails_when_called_is_refused_before_any_run(tmp_path, user_targets, target, starts):
    message = _refused(tmp_path, *TINY, f"model._target_=mylab_targets.{target}", env=user_targets)
    assert message.startswith(starts), message


# --- hardware the machine does not have ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with GPUs has /gpu:0")
def test_devices_the_machine_does_not_have_are_refused(tmp_path):
    message = _refused(tmp_path, *TINY, "strategy.devices=[/gpu:0,/gpu:1]")
    assert message.startswith(
        "strategy.devices=['/gpu:0', '/gpu:1'] is not valid: this machine has no /gpu:0, /gpu:1; TensorFlow sees /cpu:0"
    ), message


@pytest.mark.slow
def test_a_tpu_name_that_does_not_resolve_is_one_paragraph(tmp_path):
    message = _refused(tmp_path, *TINY, "strategy=tpu", "strategy.tpu=my-tpu")
    assert message.startswith("strategy=tpu found no TPU at strategy.tpu='my-tpu'"), message


# --- what a new user with a project of their own meets -------------------------------------------------------------


@pytest.fixture
def own_project(tmp_path, monkeypatch) -> Path:
    """A user's project: a config directory of their own (model=convnet, dataset=bar) and a package beside it."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "dataset").mkdir()
    (tmp_path / "conf" / "model" / "convnet.yaml").write_text("_target_: mylab_own.convnet\n")
    (tmp_path / "conf" / "dataset" / "bar.yaml").write_text("_target_: mylab_own.load\nname: bar\n")
    (tmp_path / "mylab_own.py").write_text(
        "def convnet(shape, num_classes, hidden=8):\n    raise NotImplementedError\n\n\n"
        "def load(seed=0):\n    raise NotImplementedError\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_suggestions_and_options_include_the_users_own_config_directory(own_project):
    searchpath = f"hydra.searchpath=[file://{own_project / 'conf'}]"
    message = _refusal(searchpath, "model=convent")
    assert message.startswith(
        "model=convent is not valid: the model group has no option 'convent' (did you mean model=convnet?); "
        "its options are cnn, convnet, resnet."
    ), message
    assert "(did you mean dataset=bar?)" in _refusal(searchpath, "dataset=barz")


def test_a_name_like_no_key_lists_the_groups_instead_of_a_wrong_suggestion():
    """`sampler` is like no key (before the pruner group existed, `pruner=median` was told to use runtime=median)."""
    message = _refusal("sampler=tpe")
    assert message.startswith("sampler=tpe is not valid: the config has no key 'sampler'. Fix: remove"), message
    assert "did you mean" not in message
    groups = "Fix: remove sampler=tpe, or pick an option of one of the config groups: cluster, dataset, hparams_search"
    assert groups in message, message


def test_a_yaml_syntax_error_names_the_file_and_line(own_project):
    (own_project / "conf" / "dataset" / "bar.yaml").write_text("_target_: mylab_own.load\nname: bar\nshape: [28, 28\n")
    message = _refusal(f"hydra.searchpath=[file://{own_project / 'conf'}]", "dataset=bar")
    assert message.startswith(
        f"dataset=bar is not valid: the YAML of {own_project / 'conf' / 'dataset' / 'bar.yaml'} cannot be read at "
        "line 3, column 8 (while parsing a flow sequence expected ',' or ']'"
    ), message


def test_a_target_of_ones_own_on_the_command_line_drops_the_options_null_arguments(own_project):
    """docs/configuration.md's form: the fashion_mnist option's `dir: null` does not reach the user's callable, and
    `~dataset.dir` (which Hydra cannot delete, being null) says so."""
    from runner.config.settings import checked_targets

    config = OmegaConf.to_container(compose(["dataset._target_=mylab_own.load", "dataset.name=mine"]), resolve=True)
    settings = checked_targets(validate(config))
    assert settings.dataset.component.target == "mylab_own.load"
    assert dict(settings.dataset.component.arguments) == {}
    message = _refusal("~dataset.dir")
    assert message.startswith("~dataset.dir is not valid: dataset.dir is already null"), message
    with pytest.raises(RunnerError, match=r"^dataset.dir is not valid: mylab_own.load takes no argument 'dir'"):
        checked_targets(validate(overridden(config, "dataset.dir=/tmp")))


def test_a_model_parameter_named_otherwise_is_told_to_rename_it(own_project):
    from runner.config.settings import checked_targets

    config = OmegaConf.to_container(compose(["model._target_=mylab_own.convnet"]), resolve=True)
    with pytest.raises(RunnerError) as raised:
        checked_targets(validate(config))
    assert str(raised.value) == (
        "model._target_='mylab_own.convnet' is not valid: the runner calls a model callable with the keyword "
        "arguments input_shape and num_classes, and mylab_own.convnet has no parameter 'input_shape' (its "
        "parameters: shape, num_classes, hidden). Fix: rename its parameter shape to input_shape (or take **kwargs)."
    )
    assert raised.value.key == "model._target_"


def test_a_refusal_carries_its_key():
    with pytest.raises(RunnerError) as raised:
        check_command_line(["batch=abc"])
    assert raised.value.key == "batch"
    with pytest.raises(RunnerError) as raised:
        check_command_line(["epoch=1"])
    assert raised.value.key == "epoch"
